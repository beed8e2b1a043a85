"""What a change may cost the device: the derived facts each stream's rules may hold, and what
the interrupted tries of a bundle cost (the poison-bundle marker)."""
