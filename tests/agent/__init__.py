"""The edge agent: bundles, the SQLite state, the service, MQTT (private Mosquitto brokers), the
zodiac-agent command line, crash and fault tests, the edge image."""
