package compile

func (c *compiler) ingresses() {}
