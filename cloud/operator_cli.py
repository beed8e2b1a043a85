"""``zodiac-cloud keys generate`` and ``zodiac-cloud bundle``: the operator's steps that need no
broker.

    zodiac-cloud keys generate cloud [--dir keys]      # cloud.key (0600) and cloud.pub
    zodiac-cloud bundle --key cloud.key --farm F --device D --rules base.rules -o d.bundle

``keys generate`` writes the Ed25519 key pair the publisher signs with (``<name>.key``, PEM
PKCS8, mode 0600) and the public key each agent trusts (``<name>.pub``, PEM SPKI, copied into its
``trusted_keys`` folder); the name is the key id bundles carry. It never overwrites a key:
replacing the signing key by accident would make every device refuse the cloud's bundles.

``bundle`` writes what ``publish`` would send, as a file, for a device without a link to the
broker (``zodiac-agent apply --config agent.toml FILE``). It is always a full state of the
stream (the file replaces whatever the device holds on it, so a file that never reached the
device does not stop the next one), numbered in the same ledger as ``publish`` (``--state``):
the version sequence of a device and stream is one, whichever way its bundles travel.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from agent.engine.errors import ZodiacError
from agent.protocol.messages import FARM_WIDE, utc

__all__ = ["add_commands"]


class UsageError(ZodiacError):
    """Bad input the operator must fix (exit 2), as opposed to a refusal (exit 1)."""


def add_commands(commands) -> None:
    """Register ``keys`` and ``bundle`` on the ``zodiac-cloud`` sub-parser collection."""
    from cloud.publisher_cli import add_signing_options

    keys = commands.add_parser(
        "keys",
        help="make the cloud's signing key pair",
        description="Make the Ed25519 key pair the publisher signs bundles with.",
    )
    actions = keys.add_subparsers(
        dest="keys_command", metavar="ACTION", required=True, help="generate"
    )
    generate = actions.add_parser(
        "generate",
        help="write NAME.key (private, mode 0600) and NAME.pub (for the agents)",
        description=(
            "Write the signing key NAME.key (PEM PKCS8, mode 0600: give it to the publisher "
            "only) and its public key NAME.pub (PEM: copy it into each agent's trusted_keys "
            "folder), and print the public key's fingerprint. NAME is the key id bundles carry "
            "(the publisher's --key cloud.key signs as key id 'cloud'). An existing key is "
            "never overwritten (exit 2)."
        ),
    )
    generate.add_argument("name", metavar="NAME", help="the key id: letters, digits, '.', '_', '-'")
    generate.add_argument(
        "--dir", type=Path, default=Path("."), metavar="DIR", help="where to write (default: .)"
    )
    generate.set_defaults(handler=cmd_keys_generate)

    bundle = commands.add_parser(
        "bundle",
        help="write a signed bundle file for zodiac-agent apply (no broker needed)",
        description=(
            "Write one stream's rules (and facts) for one device as a signed full-state bundle "
            "file, which 'zodiac-agent apply --config agent.toml FILE' applies with the checks "
            "of a bundle received over MQTT. The version continues the sequence of --state, "
            "the ledger 'publish' uses."
        ),
    )
    bundle.add_argument("--farm", required=True, help="the farm id")
    bundle.add_argument(
        "--device", required=True, help=f"the device id ({FARM_WIDE!r}: every device of the farm)"
    )
    bundle.add_argument("--stream", default="base", help="the stream name (default: base)")
    bundle.add_argument(
        "--rules", required=True, type=Path, metavar="FILE", help="the stream's rules (labelled)"
    )
    bundle.add_argument(
        "--facts",
        type=Path,
        default=None,
        metavar="FILE",
        help="facts to send with the rules (N-Triples or Turtle)",
    )
    bundle.add_argument(
        "--neighbour-predicate",
        default=None,
        help="with --facts: send only the facts about the device and its neighbours by this "
        "predicate, as publish does",
    )
    bundle.add_argument(
        "--own-facts",
        action="store_true",
        help="with --facts: send only the facts about the device itself (its neighbour links "
        "included), as publish --own-facts does",
    )
    add_signing_options(bundle, ttl_default=None)
    bundle.add_argument(
        "-o", "--out", required=True, type=Path, metavar="OUT", help="the bundle file to write"
    )
    bundle.set_defaults(handler=cmd_bundle)


def _fail(message: str, code: int) -> int:
    print(f"zodiac-cloud: {message}", file=sys.stderr)
    return code


def cmd_keys_generate(args: argparse.Namespace) -> int:
    from agent.protocol.keys import fingerprint, generate_key_pair, load_public_key

    try:
        private, public = generate_key_pair(args.dir, args.name)
    except FileExistsError as error:
        return _fail(f"{error}: not overwritten (remove it first to make a new key)", 2)
    except ValueError as error:
        return _fail(f"key name {args.name!r}: {error}", 2)
    except OSError as error:
        return _fail(f"{args.dir}: cannot write the keys ({error.strerror or error})", 2)
    print(f"private key  {private}  (mode 0600: for the publisher only)")
    print(f"public key   {public}  (copy into each agent's trusted_keys folder)")
    print(f"fingerprint  {fingerprint(load_public_key(public))}")
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    try:
        return _bundle(args)
    except UsageError as error:
        return _fail(str(error).splitlines()[0], 2)


def _bundle(args: argparse.Namespace) -> int:
    from agent.config import _check_device_id, _check_id
    from agent.engine.program.rdf import read_facts
    from agent.protocol.keys import load_private_key
    from agent.protocol.signing import sign_bundle
    from cloud.bundles import DEFAULT_TTL, BundleCutter, facts_for, load_stream_file, stream_target

    for option, value, check in (
        ("--farm", args.farm, _check_id),
        ("--device", args.device, _check_id if args.device == FARM_WIDE else _check_device_id),
    ):
        try:
            check(value)
        except ValueError as error:
            raise UsageError(f"{option}: {error}") from None
    out: Path = args.out
    if out.is_dir():
        raise UsageError(f"-o {out}: a directory, not a file")
    if not out.parent.is_dir():
        raise UsageError(f"-o {out}: no such directory {out.parent}")
    private_key = load_private_key(args.key)  # (before the ledger: nothing recorded on a typo)
    rules = load_stream_file(args.rules)
    facts: set[tuple] = set()
    if args.facts is not None:
        facts = facts_for(
            read_facts(args.facts), args.device, args.neighbour_predicate, own_only=args.own_facts
        )
    if not rules and not facts and not rules.windows:
        raise UsageError(f"{args.rules}: no rules (and no facts): the bundle would be empty")
    ttl = args.bundle_ttl if args.bundle_ttl is not None else DEFAULT_TTL
    cutter = BundleCutter(args.state, args.farm, ttl=ttl)
    bundle = cutter.full_state(args.device, args.stream, stream_target(rules, facts))
    bundle.parsed_rules()  # what the device checks: refused here rather than there
    payload = sign_bundle(bundle, private_key, args.key.stem)
    partial = out.with_name(f".{out.name}.partial")
    partial.write_bytes(payload)
    os.replace(partial, out)  # (never a half-written bundle file under the name given)
    print(
        f"wrote {out}: {args.device} {args.stream} version {bundle.version} (full state, "
        f"{len(rules)} rules, {len(facts)} facts, valid until {utc(bundle.expires_at)})"
    )
    return 0
