"""What ``zodiac-edge`` (``agent/engine/cli.py``) needs beyond argument parsing: facts and
IRIs as a user types and reads them (``terms``) and the interactive shell (``shell``)."""
