"""What travels between the cloud and a device: the message models, Ed25519 keys, and signing
and opening bundles."""
