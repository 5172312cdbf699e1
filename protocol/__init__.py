"""Sans-io AMQP 0-9-1 framing and codecs: bytes in, frames out; commands in, bytes out."""
