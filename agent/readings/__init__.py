"""What the agent keeps of its readings over time: windows (``windows.py``)."""
