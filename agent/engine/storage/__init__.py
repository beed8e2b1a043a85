"""Facts in memory: relations and data stores, facts by subject, the changes an update makes,
and the read-only view readers use."""
