"""`delayqueue`, the command line of the client: send, get, delete, consume, stats, dead letters,
and `worker` (worker processes of an App, supervisor.py).

Exit codes: 0 done, 1 the server refused or did not find it, 2 usage error, 3 server unreachable,
4 the answer was lost (the command may have been applied).
"""
import argparse
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any
from datetime import datetime, timezone

from delayqueue_client import supervisor
from delayqueue_client.client import Client
from delayqueue_client.errors import DelayQueueError, MaybeApplied, NotFound, Unavailable
from delayqueue_client.message import Message

OK, REFUSED, USAGE, UNREACHABLE, MAYBE_APPLIED = 0, 1, 2, 3, 4
STATUS_NAMES = {1: "waiting", 2: "ready", 3: "consuming", 4: "acked", 5: "expired", 6: "dead", 7: "deleted"}
UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
CONSUME_WAIT_MS = 10_000  # each long poll's hold; the server caps it anyway
EPILOG = """\
environment: DELAYQUEUE_URL (default http://127.0.0.1:8000), DELAYQUEUE_TOKEN.
exit codes: 0 done, 1 the server refused or did not find it, 2 usage error, 3 server unreachable,
4 the answer was lost (the command may have been applied)."""


def duration_ms(text: str) -> int:
    """'250ms', '3s', '1.5m', '2h', '1d' in milliseconds; a unit is required (is '3' seconds or ms?)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", text)
    if not found:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: a number and a unit, e.g. 250ms, 3s, 5m, 2h, 1d")
    return round(float(found[1]) * UNIT_MS[found[2]])


def instant_ms(text: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (without a zone: this machine's local time)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: epoch milliseconds or ISO 8601, e.g. 2030-01-31T09:00:00+01:00") from None
    return round(moment.timestamp() * 1000)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: a whole number of at least 1")
    return int(text)


def iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_json(message: Message) -> str:
    return json.dumps(asdict(message), ensure_ascii=False)


def message_lines(message: Message) -> str:
    fields = [("topic", message.topic), ("msg_id", message.msg_id),
              ("status", f"{message.status} {STATUS_NAMES.get(message.status, '?')}"),
              ("trigger_time", iso(message.trigger_time)), ("expire_time", iso(message.expire_time)),
              ("produce_time", iso(message.produce_time)), ("retry", f"{message.retry} of {message.max_retry}"),
              ("priority", message.priority)]
    if message.dead_time is not None:
        fields += [("dead_reason", message.dead_reason), ("dead_time", iso(message.dead_time))]
    fields.append(("msg", message.msg))
    return "\n".join(f"{name:<13}{value}" for name, value in fields)


def out(text: str) -> None:
    print(text, flush=True)


# --- commands: each takes the parsed arguments and a Client, prints, answers an exit code

def cmd_send(args: argparse.Namespace, client: Client) -> int:
    msg = sys.stdin.read() if args.msg == "-" else args.msg
    sent = client.send(args.topic, msg, delay_ms=args.delay, trigger_time=args.at, msg_id=args.msg_id,
                       ttl_ms=args.ttl, max_retry=args.max_retry, priority=args.priority)
    out(message_json(sent) if args.json else
        f"sent {sent.msg_id} to {sent.topic}, due {iso(sent.trigger_time)} ({STATUS_NAMES.get(sent.status, '?')})")
    return OK


def cmd_get(args: argparse.Namespace, client: Client) -> int:
    message = client.get(args.topic, args.msg_id)
    if message is None:
        raise NotFound(f"message {args.msg_id} not found in topic {args.topic}")
    out(message_json(message) if args.json else message_lines(message))
    return OK


def cmd_delete(args: argparse.Namespace, client: Client) -> int:
    if not client.delete(args.topic, args.msg_id):
        raise NotFound(f"message {args.msg_id} not found or already ended in topic {args.topic}")
    out(json.dumps({"deleted": True, "topic": args.topic, "msg_id": args.msg_id}) if args.json else
        f"deleted {args.msg_id} from {args.topic}")
    return OK


def cmd_consume(args: argparse.Namespace, client: Client) -> int:
    """Long-polls and prints each message as it comes; acks it once printed (unless --no-ack).
    Ctrl-C or SIGTERM ends it with code 0; what was pulled and not yet acked waits for its ack timeout."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    printed = 0
    try:
        while args.count is None or printed < args.count:
            # Never take more than --count still wants: an extra message would sit until its ack timeout.
            batch = args.batch if args.count is None else min(args.batch, args.count - printed)
            for message in client.pull(args.topic, batch=batch, ack_timeout_ms=args.ack_timeout,
                                       wait_ms=CONSUME_WAIT_MS):
                out(message_json(message) if args.json else f"{message.msg_id}\t{message.msg}")
                printed += 1
                if not args.no_ack:
                    client.ack(args.topic, message.msg_id)
    except KeyboardInterrupt:
        pass
    return OK


def topic_info_table(infos: list[dict[str, Any]]) -> str:
    rows = [("topic", "waiting", "ready", "consuming")]
    rows += [(i["topic"], str(i["waitingQueueSize"]), str(i["readyQueueSize"]), str(i["ackQueueSize"])) for i in infos]
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    return "\n".join("  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in
                               enumerate(zip(row, widths))).rstrip() for row in rows)


def cmd_stats(args: argparse.Namespace, client: Client) -> int:
    if args.topic is None:
        infos = client.topic_infos()
        out(json.dumps(infos) if args.json else topic_info_table(infos) if infos else "no topics")
        return OK
    info = client.topic_info(args.topic)
    if args.json:
        out(json.dumps(info))
    else:
        waiting = info.get("waitingQueueInfo", {})
        width = max(map(len, waiting), default=0) + 2  # the labels run to 20 characters (sizeOf30dayToInfinite)
        buckets = "\n".join(f"  {name:<{width}}{count}" for name, count in waiting.items())
        out(topic_info_table([info]) + ("\nwaiting, by time until due:\n" + buckets if buckets else ""))
    return OK


def cmd_dead_list(args: argparse.Namespace, client: Client) -> int:
    page = client.dead_letters(args.topic, limit=args.limit, cursor=args.cursor)
    if args.json:
        out(json.dumps({"messages": [asdict(m) for m in page.messages], "next_cursor": page.next_cursor},
                       ensure_ascii=False))
        return OK
    for m in page.messages:
        why = f"{m.dead_reason}: {m.dead_detail}" if m.dead_detail else m.dead_reason
        out(f"{m.msg_id}\t{iso(m.dead_time)}\t{why}\t{m.msg}")
    if not page.messages:
        out(f"no dead letters in {args.topic}")
    if page.next_cursor:
        out(f"more: delayqueue dead list {args.topic} --cursor {page.next_cursor}")
    return OK


def cmd_dead_redrive(args: argparse.Namespace, client: Client) -> int:
    task_id = client.redrive(args.topic, args.msg_id, max_per_second=args.rate)
    task = None
    if args.wait:
        while (task := client.redrive_task(task_id))["state"] != "done":
            time.sleep(0.2)
    if args.json:
        out(json.dumps({"task_id": task_id, **(task or {})}))
    else:
        out(f"redrive task {task_id} started" if task is None else
            f"redrive task {task_id} done: {task['moved']} moved, {task['left']} left")
    return OK


def cmd_dead_purge(args: argparse.Namespace, client: Client) -> int:
    if args.msg_id is None and not args.all:
        raise UsageError("dead purge removes dead letters for good: name them with --msg-id, or pass --all")
    count = client.purge_dead(args.topic, args.msg_id)
    out(json.dumps({"purged": count}) if args.json else f"purged {count} dead letters from {args.topic}")
    return OK


def cmd_worker(args: argparse.Namespace, client: Client) -> int:
    """Supervises worker processes of an App (supervisor.py); the App brings its own client."""
    try:
        return supervisor.supervise(args)
    except supervisor.AppNotFound as exc:
        raise UsageError(str(exc)) from None


class UsageError(Exception):
    """Arguments argparse accepted that do not make sense together."""


def build_parser() -> argparse.ArgumentParser:
    def add_common(to: argparse.ArgumentParser, default: Any) -> None:
        to.add_argument("--url", default=default,
                        help="the server's base URL (default: DELAYQUEUE_URL, else http://127.0.0.1:8000)")
        to.add_argument("--token", default=default, help="API token (default: DELAYQUEUE_TOKEN). Prefer the "
                        "variable: an option is visible to every user of this machine in the process list (ps)")
        to.add_argument("--json", action="store_true", default=default or False,
                        help="print JSON (one object per line) for scripts")

    parser = argparse.ArgumentParser(prog="delayqueue", description="Send, inspect and consume delayqueue messages.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(parser, None)
    # Accepted after the command too; SUPPRESS keeps a subcommand from resetting what came before it.
    common = argparse.ArgumentParser(add_help=False)
    add_common(common, argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace, Client], int], help_text: str,
                parent: Any = commands) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = parent.add_parser(name, parents=[common], help=help_text, description=help_text, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(handler=handler)
        return sub

    send = command("send", cmd_send, "send a message (due now unless --delay or --at)")
    send.add_argument("topic")
    send.add_argument("msg", help="the message text; - reads it from standard input")
    when = send.add_mutually_exclusive_group()
    when.add_argument("--delay", type=duration_ms, help="due after this long: 250ms, 3s, 5m, 2h, 1d")
    when.add_argument("--at", type=instant_ms, help="due at this time: epoch ms or ISO 8601 (no zone: local time)")
    send.add_argument("--msg-id", help="its id (default: one made by the client); a live id is not sent twice")
    send.add_argument("--ttl", type=duration_ms, help="how long after falling due it may still be delivered")
    send.add_argument("--max-retry", type=int, help="deliveries after the first before it ends")
    send.add_argument("--priority", type=int, help="0 (default) to 9, higher first")

    for name, handler, help_text in (("get", cmd_get, "show a message"),
                                     ("delete", cmd_delete, "delete a live message")):
        sub = command(name, handler, help_text)
        sub.add_argument("topic")
        sub.add_argument("msg_id", metavar="MSG_ID")

    consume = command("consume", cmd_consume, "print messages as they fall due, acking each once printed; "
                                              "Ctrl-C stops")
    consume.add_argument("topic")
    consume.add_argument("--no-ack", action="store_true",
                         help="do not ack: the messages come back after their ack timeout")
    consume.add_argument("--batch", type=positive_int, default=10, help="messages per pull (default 10)")
    consume.add_argument("--count", type=positive_int, help="stop after this many messages")
    consume.add_argument("--ack-timeout", type=duration_ms, help="ack timeout of the pulled messages "
                                                                 "(default: the topic's)")

    stats = command("stats", cmd_stats, "queue sizes of a topic, or of every topic")
    stats.add_argument("topic", nargs="?")

    worker = command("worker", cmd_worker, "run an App's tasks in worker processes: SIGTERM or Ctrl-C drains, "
                                           "a second one stops hard")
    supervisor.add_arguments(worker)

    dead = commands.add_parser("dead", parents=[common], help="dead letters: list, redrive, purge",
                               description="Dead letters.")
    dead_commands = dead.add_subparsers(dest="dead_command", required=True, metavar="COMMAND")
    listing = command("list", cmd_dead_list, "list a topic's dead letters, oldest death first", dead_commands)
    listing.add_argument("topic")
    listing.add_argument("--limit", type=positive_int, default=100, help="at most this many (default 100)")
    listing.add_argument("--cursor", help="the next page, as the previous listing said")
    redrive = command("redrive", cmd_dead_redrive, "send dead letters back to be delivered again", dead_commands)
    redrive.add_argument("topic")
    redrive.add_argument("--msg-id", action="extend", nargs="+", help="only these (default: all of the topic's)")
    redrive.add_argument("--rate", type=positive_int, help="messages per second (server default 500)")
    redrive.add_argument("--wait", action="store_true", help="wait until the redrive is done")
    purge = command("purge", cmd_dead_purge, "remove dead letters for good", dead_commands)
    purge.add_argument("topic")
    purge.add_argument("--msg-id", action="extend", nargs="+", help="only these")
    purge.add_argument("--all", action="store_true", help="all of the topic's dead letters")
    return parser


def error_line(error: DelayQueueError) -> str:
    return error.msg if error.code is None else f"{error.code} {error.msg}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        client = Client(args.url, args.token)
    except ValueError as exc:  # a URL that is not http(s)
        parser.error(str(exc))
    try:
        with client:
            code: int = args.handler(args, client)
            return code
    except UsageError as exc:
        parser.error(str(exc))  # exits with code 2
    except (Unavailable, MaybeApplied) as exc:
        print(f"delayqueue: error: {exc.msg} ({client.base_url})", file=sys.stderr)
        return UNREACHABLE if isinstance(exc, Unavailable) else MAYBE_APPLIED
    except DelayQueueError as exc:
        print(f"delayqueue: error: {error_line(exc)}", file=sys.stderr)
        return REFUSED
    except BrokenPipeError:  # `delayqueue consume t | head -3`: the reader left, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush fails silently
        return OK
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """The console script's entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
