package cnierr

import "strings"

// Mismatch joins CHECK findings about what into one code-106 error; nil
// when there are none.
func Mismatch(what string, problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return New(CheckFailed, "%s: %s", what, strings.Join(problems, "; "))
}

// AddFinding adds err, a part of a CHECK, to problems when it is a CHECK
// failure (code 106); any other error is returned, to end the CHECK.
func AddFinding(problems *[]string, err error) error {
	if err == nil {
		return nil
	}
	if code, _ := Code(err); code != CheckFailed {
		return err
	}
	*problems = append(*problems, err.Error())
	return nil
}
