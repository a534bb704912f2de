module fedgate/tests/clients/goamqp

go 1.25

require github.com/Azure/go-amqp v1.7.0
