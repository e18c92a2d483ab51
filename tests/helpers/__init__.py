"""What the tests share: AWS and moto stand-ins, the Lambda invoker, TLS redis-servers, the
CDK synthesis helpers, the channel contract and small engine doubles. Imported as
``tests.helpers.<module>``; some modules also run as scripts (``lambda_invoke``,
``moto_additions``, ``moto_stack serve``)."""
