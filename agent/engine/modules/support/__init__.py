"""What several evaluation modules share: deltas, look-ups, changes by subject, aggregate groups
kept between updates, decomposition instances."""
