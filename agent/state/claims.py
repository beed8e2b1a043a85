"""Who asserted what: the sources that claim each explicit fact and each named rule of an agent.

A source is a bundle stream (``base``, or ``all:base`` for the farm-wide stream of that name),
the configuration's local files (``local``), the device's sensors (``sensor``) or one
neighbour's telemetry (``telemetry/<device>``). Two sources may assert the same fact, or the
same rule under the same name, so the agent keeps a *claim* per (item, source):

* a fact is explicit while at least one source claims it; a named rule is in the program while
  at least one source claims its name;
* a change made by a source adds and removes *its own* claims: only what gains its first claim
  enters the engine, only what loses its last claim leaves it;
* a source may delete only what it claims itself, or what a source it explicitly supersedes
  claims (the cloud says so in the signed bundle); deleting anything else is refused with
  :class:`OwnershipError` and changes nothing. Deleting what nobody holds is a no-op.

This module only plans a change: it reads the current claims through two small functions and
returns what the engine must do and which claim rows to write (``agent/state/agent_state.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agent.engine.errors import RuleError, ZodiacError
from agent.engine.language import Rule

RuleClaims = dict[str, dict[str, str]]  # rule name -> {source: content key}


class OwnershipError(ZodiacError):
    """A change deletes a rule or fact that another source asserted (stream isolation)."""


@dataclass
class ClaimChange:
    """One change as the engine sees it, and the claim rows to write for it."""

    add_rules: list[Rule] = field(default_factory=list)  # for the engine
    delete_rules: list[str] = field(default_factory=list)
    add_facts: list[tuple] = field(default_factory=list)
    delete_facts: list[tuple] = field(default_factory=list)
    claimed_rules: list[Rule] = field(default_factory=list)  # rows (name, source) to insert
    released_rules: list[tuple[str, str]] = field(default_factory=list)  # (name, source)
    claimed_facts: list[tuple] = field(default_factory=list)  # facts claimed by the source
    released_facts: list[tuple[tuple, str]] = field(default_factory=list)  # (fact, source)


def plan_change(
    source: str,
    *,
    add_rules: Iterable[Rule],
    delete_rules: Iterable[str],
    add_facts: Iterable[tuple],
    delete_facts: Iterable[tuple],
    rule_claims: RuleClaims,
    fact_claims: Callable[[tuple], set[str]],
    resolve_names: Callable[[list[str]], set[str]],
    superseded: Iterable[str] = (),
) -> ClaimChange:
    """Plan a change by ``source`` (see the module docstring): a net change, as
    ``engine.net_change.NetChange`` folds one (no fact both added and deleted).

    ``rule_claims`` are the current rule claims; ``fact_claims(fact)`` the sources claiming a
    fact; ``resolve_names`` turns rule names, keys or texts into names (raising for unknown
    ones, as ``Reasoner.delete_rules`` does). Raises OwnershipError or RuleError, and then
    nothing has been changed."""
    may_delete = {source, *superseded}
    change = ClaimChange()
    claims = {name: dict(holders) for name, holders in rule_claims.items()}

    # Rules: deletions first, then additions (a name deleted and re-added is replaced).
    for name in sorted(resolve_names(list(delete_rules))):
        holders = claims.get(name, {})
        mine = sorted(set(holders) & may_delete)
        if holders and not mine:
            raise OwnershipError(
                f"{_who(source)} may not delete rule {name!r}: it was added by {_list(holders)}"
            )
        for holder in mine:
            del holders[holder]
            change.released_rules.append((name, holder))
        if not holders:
            claims.pop(name, None)
            change.delete_rules.append(name)
    for rule in add_rules:
        holders = claims.setdefault(rule.id, {})
        keys = set(holders.values())
        if keys and keys != {rule.key}:
            raise RuleError(
                f"label {rule.id} is already used by a different rule (added by "
                f"{_list(holders)}); delete it in the same update to replace it",
                rule=str(rule),
            )
        if source in holders:
            continue
        if not holders:
            change.add_rules.append(rule)
        holders[source] = rule.key
        change.claimed_rules.append(rule)

    # Facts (a net change: none both added and deleted, each once; engine/net_change.py).
    for fact in delete_facts:
        holders = fact_claims(fact)
        mine = holders & may_delete
        if holders and not mine:
            raise OwnershipError(
                f"{_who(source)} may not delete fact {fact!r}: it was added by {_list(holders)}"
            )
        change.released_facts += [(fact, holder) for holder in sorted(mine)]
        if holders and not holders - mine:
            change.delete_facts.append(fact)
    for fact in add_facts:
        holders = fact_claims(fact)
        if source in holders:
            continue
        change.claimed_facts.append(fact)
        if not holders:
            change.add_facts.append(fact)
    return change


def _who(source: str) -> str:
    return f"stream {source!r}" if source not in ("local", "sensor") else f"source {source!r}"


def _list(holders: Iterable[str]) -> str:
    return ", ".join(repr(h) for h in sorted(holders))
