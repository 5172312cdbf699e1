"""A broker's own client connections to brokers (this one or others), as shovels and federation links make them:
the AMQP 0-9-1 client (client), AMQP URIs (uri), RabbitMQ's checks of a runtime parameter's value (validation), the
headers a link adds to what it moves (headers) and what the API shows of a link (status)."""
