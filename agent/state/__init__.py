"""The agent's SQLite state file: the AgentState that loads and commits it, its schema and
migrations, how facts, terms and rules are packed into rows, and who claims each fact and
rule."""
