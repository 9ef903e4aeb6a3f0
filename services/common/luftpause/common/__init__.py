"""What the services share: the endpoint file, auth, tracing, logs, options from the
environment, prompt prefixes and process supervision."""
