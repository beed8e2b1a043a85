"""Reading back the rules an agent's state file saved, and finding the damaged ones.

Since schema version 7 a saved rule has its syntax tree as JSON beside its text
(``agent/engine/program/rule_form.py``): a restart builds the rule from that form, which costs a
fraction of parsing the text again. Since version 10 each row also has a CRC-32 of all its
columns (`row_checksum`): a row that matches it holds the rule as it was validated and keyed
when it was saved, so its saved content key is taken as it is and the rule is not validated
again (together about two thirds of reading a rule back: a program of 2,000 rules restarts in
a fraction of the time). The form reader still checks every field of the tree. A row without
a checksum (a file of an older version read as it is by a health check, or upgraded) is
validated and keyed afresh and compared with its saved key; a row without a form (the same,
or a rule whose text no longer parsed when its file was upgraded to version 7) is parsed from
its text.
"""

from __future__ import annotations

import json
import zlib

from agent.engine.errors import ZodiacError
from agent.engine.language import Rule
from agent.engine.program.parser import parse_program
from agent.engine.program.rule_form import rule_form, rule_from_form
from agent.engine.program.validation import check_rule

# A saved rule row, as the rules table's columns (agent/state/agent_state.py): name, content key,
# text, stream, bundle id, position, form (None before version 7), checksum (None before 10).
SavedRule = tuple[str, str, str, str, str | None, int, str | None, int | None]
# A damaged saved rule: (its name, what is wrong with it).
Damage = tuple[str, str]


def row_checksum(
    name: str,
    key: str,
    text: str,
    stream: str,
    bundle_id: str | None,
    position: int,
    form: str | None,
) -> int:
    """The CRC-32 of a rule row's columns (all of them: a row is never changed once written,
    only deleted). Texts are encoded as they are (surrogatepass: a damaged text must give a
    mismatch, not an exception)."""
    fields = json.dumps([name, key, text, stream, bundle_id, position, form], ensure_ascii=False)
    return zlib.crc32(fields.encode("utf-8", "surrogatepass"))


def read_saved_rules(rows: list[SavedRule]) -> tuple[dict[tuple[str, str], Rule], Damage | None]:
    """Each row's rule, keyed by ``(name, text)`` (a rule claimed by several sources has a row
    per source, read once), and the first damaged rule found with the reason, or None: one
    whose row does not match its checksum, that does not read back, fails validation, or
    whose content key is not the one saved with it. After a damaged rule the rules found so
    far are returned."""
    rules: dict[tuple[str, str], Rule] = {}
    unparsed: dict[tuple[str, str], None] = {}  # (in order, each row once)
    keys: list[tuple[tuple[str, str], str]] = []  # the saved keys left to compare, by row
    for name, key, text, stream, bundle_id, position, form, crc in rows:
        if crc is not None and crc != row_checksum(
            name, key, text, stream, bundle_id, position, form
        ):
            return rules, (name, "its row does not match its checksum")
        vouched = crc is not None and form is not None
        if not vouched:
            keys.append(((name, text), key))
        if (name, text) in rules or (name, text) in unparsed:
            continue
        if form is None:
            unparsed[name, text] = None
            continue
        try:
            rule = rule_from_form(form)
            if vouched:
                rule.mark_saved(key)
            if rule.id != name:
                raise ValueError(f"its form is the rule {rule.id}")
            if not vouched:
                check_rule(rule)
        except (ZodiacError, ValueError) as error:
            return rules, (name, _one_line(error))
        rules[name, text] = rule
    if unparsed:
        parsed, problem = parse_saved_texts(list(unparsed))
        rules.update(parsed)
        if problem:
            return rules, problem
    for row, key in keys:  # a form damaged into another valid rule, say
        if rules[row].key != key:
            return rules, (row[0], f"it reads back as content {rules[row].key}, saved as {key}")
    return rules, None


def parse_saved_texts(
    saved: list[tuple[str, str]],
) -> tuple[dict[tuple[str, str], Rule], Damage | None]:
    """Rules ``(name, text)`` parsed from their text, as one program (a parse has a fixed
    cost, paid once) or, when that fails, one by one to name the damaged one."""
    try:
        rules = parse_program("\n".join(text for _, text in saved), source="<saved rules>").rules
    except (ZodiacError, ValueError):
        rules = ()
    if len(rules) == len(saved) and all(
        rule.id == name for rule, (name, _) in zip(rules, saved, strict=True)
    ):
        return dict(zip(saved, rules, strict=True)), None
    found: dict[tuple[str, str], Rule] = {}
    for name, text in saved:
        try:
            found[name, text] = parse_saved_rule(name, text)
        except (ZodiacError, ValueError) as error:
            return found, (name, _one_line(error))
    return found, None


def parse_saved_rule(name: str, text: str) -> Rule:
    """The one rule named ``name`` that ``text`` holds (ValueError if it holds another)."""
    program = parse_program(text, source=f"<saved rule {name}>")
    if len(program.rules) != 1 or program.rules[0].id != name:
        raise ValueError(f"it does not parse back to itself: {text!r}")
    return program.rules[0]


def form_of_text(name: str, text: str) -> str | None:
    """The form of the saved rule ``text`` (upgrading a file to version 7), or None when the
    text does not parse back to the rule ``name``: the row keeps only its text, and the state's
    integrity check reports it as damaged, as it did before."""
    try:
        return rule_form(parse_saved_rule(name, text))
    except (ZodiacError, ValueError):
        return None


def _one_line(error: Exception) -> str:
    """The error's message on one line (a rule error adds the rule on a line of its own): the
    agent reports a damaged state in one line."""
    return " ".join(str(error).split())
