"""From text to rules: the parser, validation, RDF input, saved rule forms, and the rule
dependency graph with its hyper-nodes."""
