"""warrenctl: rabbitmqctl's verbs over Warren's management HTTP API."""
