"""Shovels: move messages from a queue or exchange of one AMQP 0-9-1 broker to another (RabbitMQ's dynamic
shovels, with its keys): broker.shovel.component runs them, broker.shovel.running is one at work."""
