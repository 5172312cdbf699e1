"""Federation: exchanges and queues of this broker that receive what is published to their namesakes on other AMQP
0-9-1 brokers (RabbitMQ's federation plugin, with its parameters, policy keys, upstream objects and headers).
broker.federation.component runs the links that the policies ask for; exchange_link and queue_link are one link at
work, upstream its definitions."""
