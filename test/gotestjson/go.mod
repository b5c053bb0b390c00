module github.com/flatnet/flatnet/test/gotestjson

go 1.26.6
