"""The cloud: the Spark job (local mode and a standalone cluster), bundle cutting and the
publisher, the zodiac-cloud command line."""
