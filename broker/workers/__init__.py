"""Several worker processes behind one AMQP port, each leading a share of the vhosts (``[server] workers``)."""
