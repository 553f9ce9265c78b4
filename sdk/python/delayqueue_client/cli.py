"""`delayqueue`, the command line of the client: send, get, delete, consume, stats, dead letters,
schedules, and `worker` (worker processes of an App, supervisor.py).

Exit codes: 0 done, 1 the server refused or did not find it, 2 usage error (or a URL not leading to the
API), 3 server unreachable or failing (code 500), 4 the answer was lost (the command may have been applied).
"""
import argparse
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any
from datetime import datetime, timedelta, timezone

from delayqueue_client import supervisor
from delayqueue_client._http import shown_url
from delayqueue_client.client import Client
from delayqueue_client.errors import DelayQueueError, MaybeApplied, NotFound, NotTheAPI, ServerError
from delayqueue_client.message import Message
from delayqueue_client.schedule import CATCH_UP, Schedule

OK, REFUSED, USAGE, UNREACHABLE, MAYBE_APPLIED = 0, 1, 2, 3, 4
STATUS_NAMES = {1: "waiting", 2: "ready", 3: "consuming", 4: "acked", 5: "expired", 6: "dead", 7: "deleted"}
UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_DURATION_MS = timedelta.max // timedelta(milliseconds=1)
CONSUME_WAIT_MS = 10_000  # each long poll's hold; the server caps it anyway
EPILOG = """\
environment: DELAYQUEUE_URL (default http://127.0.0.1:8000), DELAYQUEUE_TOKEN.
exit codes: 0 done, 1 the server refused or did not find it, 2 usage error (or a URL not leading to the
API), 3 server unreachable or failing (code 500), 4 the answer was lost (the command may have been applied)."""


def duration_ms(text: str) -> int:
    """'250ms', '3s', '1.5m', '2h', '1d' in milliseconds; a unit is required (is '3' seconds or ms?)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", text)
    if not found:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: a number and a unit, e.g. 250ms, 3s, 5m, 2h, 1d")
    ms = float(found[1]) * UNIT_MS[found[2]]
    # Beyond a timedelta (schedule options go to the client as ones) or infinite (hundreds of digits):
    # timedelta() or round() would raise OverflowError, a traceback.
    if not ms <= MAX_DURATION_MS:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: too long")
    return round(ms)


def instant_ms(text: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (without a zone: this machine's local time)."""
    if text.isascii() and text.isdigit():  # not '¹²³', which int() refuses
        return int(text)
    try:  # a zoneless time too early or late for this machine's zone: timestamp() refuses it
        return round(datetime.fromisoformat(text).timestamp() * 1000)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: epoch milliseconds or ISO 8601, e.g. 2030-01-31T09:00:00+01:00") from None


def instant_or_none(text: str) -> int:
    """instant_ms, or 'none' (0: the API's "no start" / "no end")."""
    return 0 if text.strip().lower() == "none" else instant_ms(text)


def given_text(example: str) -> Callable[[str], str]:
    """An option's text, refused when empty: the server takes an empty parameter as not given, so
    `update --cron ''` would change nothing and say no field was given."""
    def text_of(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"empty: the server would take it as not given; give {example}")
        return text
    return text_of


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


def duration_text(ms: int) -> str:
    """ms in the largest unit that says it exactly: 86400000 -> 1d, 90000 -> 90s."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % UNIT_MS[unit] == 0:
            return f"{ms // UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def schedule_rule(schedule: Schedule) -> str:
    if schedule.cron is not None:
        return f"cron '{schedule.cron}' ({schedule.timezone})"
    return f"every {duration_text(schedule.every_ms or 0)}"


def schedule_next(schedule: Schedule) -> str:
    if schedule.paused:
        return "paused"
    return f"next {iso(schedule.next_fire_times[0])}" if schedule.next_fire_times else "no more ticks"


def schedule_summary(schedule: Schedule) -> str:
    return f"{schedule.schedule_id} on {schedule.topic}: {schedule_rule(schedule)}, {schedule_next(schedule)}"


def schedule_json(schedule: Schedule) -> str:
    return json.dumps(asdict(schedule), ensure_ascii=False)


def schedule_lines(schedule: Schedule) -> str:
    fields: list[tuple[str, object]] = [
        ("schedule_id", schedule.schedule_id), ("topic", schedule.topic), ("rule", schedule_rule(schedule)),
        ("paused", "yes" if schedule.paused else "no"), ("start_time", iso(schedule.start_time)),
        ("end_time", iso(schedule.end_time)), ("catch_up", schedule.catch_up), ("priority", schedule.priority),
        ("ttl", duration_text(schedule.ttl_ms) if schedule.ttl_ms else "the topic's"),
        ("max_retry", schedule.max_retry if schedule.max_retry >= 0 else "the topic's"),
        ("next_fires", ", ".join(iso(t) for t in schedule.next_fire_times) or "-"),
        ("create_time", iso(schedule.create_time)), ("update_time", iso(schedule.update_time)),
        ("msg", schedule.msg)]
    return "\n".join(f"{name:<13}{value}" for name, value in fields)


def out(text: str) -> None:
    print(text, flush=True)


def not_utf8(value: object) -> bool:
    """Whether an argument holds text that is not UTF-8: a byte of argv or stdin that is not comes
    as a lone surrogate (surrogateescape), which the request's encoding would raise on."""
    if isinstance(value, list):
        return any(not_utf8(item) for item in value)
    return isinstance(value, str) and re.search("[\ud800-\udfff]", value) is not None


def msg_text(msg: str) -> str:
    """A MSG argument: the text, or standard input for '-'."""
    text = sys.stdin.read() if msg == "-" else msg
    if not_utf8(text):
        raise UsageError("the message is not UTF-8 text")
    return text


# --- commands: each takes the parsed arguments and a Client, prints, answers an exit code

def cmd_send(args: argparse.Namespace, client: Client) -> int:
    msg = msg_text(args.msg)
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


class HeldInterrupt:
    """SIGINT and SIGTERM as KeyboardInterrupt, held while `held` is set until the work is done: a message
    being printed is printed whole and acked, else it would come back after its ack timeout and print twice.
    A second signal meanwhile (an ack that hangs) raises at once."""

    def __init__(self) -> None:
        self.held = self.pending = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.held and not self.pending:
            self.pending = True
            return
        raise KeyboardInterrupt

    def release(self) -> None:
        self.held = False
        if self.pending:
            raise KeyboardInterrupt


def cmd_consume(args: argparse.Namespace, client: Client) -> int:
    """Long-polls and prints each message as it comes; acks it once printed (unless --no-ack).
    Ctrl-C or SIGTERM ends it with code 0, once the message being printed is printed and acked; what
    was pulled and not yet printed waits for its ack timeout."""
    interrupt = HeldInterrupt()  # also when started with SIGINT ignored
    given_back = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    printed = 0
    try:
        while args.count is None or printed < args.count:
            # Never take more than --count still wants: an extra message would sit until its ack timeout.
            batch = args.batch if args.count is None else min(args.batch, args.count - printed)
            for message in client.pull(args.topic, batch=batch, ack_timeout_ms=args.ack_timeout,
                                       wait_ms=CONSUME_WAIT_MS):
                interrupt.held = True
                out(message_json(message) if args.json else f"{message.msg_id}\t{message.msg}")
                printed += 1
                if not args.no_ack:  # this delivery's: one made since (a slow print) is another consumer's
                    client.ack(args.topic, message.msg_id, retry=message.retry)
                interrupt.release()
    except KeyboardInterrupt:
        pass
    finally:  # main() may be called in a process of the caller's
        for signum, handler in given_back.items():
            signal.signal(signum, handler)
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


DEFAULT_PAGE = 100  # a listing's --limit


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
        out(more_hint(["dead", "list", args.topic], args, page.next_cursor))
    return OK


def more_hint(command: list[str], args: argparse.Namespace, cursor: str) -> str:
    """The command line of a listing's next page: the same words and page size, quoted for a shell."""
    limit = [] if args.limit == DEFAULT_PAGE else ["--limit", str(args.limit)]
    return "more: " + shlex.join(["delayqueue", *command, *limit, "--cursor", cursor])


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


def schedule_options(args: argparse.Namespace) -> dict[str, Any]:
    """The schedule options given on the command line, as create_schedule's / update_schedule's keywords."""
    ms_to_delta = {"every": args.every, "ttl": args.ttl}
    options: dict[str, Any] = {name: timedelta(milliseconds=ms) for name, ms in ms_to_delta.items() if ms is not None}
    options.update({name: value for name, value in (
        ("cron", args.cron), ("timezone", args.timezone), ("start", args.start), ("end", args.end),
        ("catch_up", args.catch_up), ("priority", args.priority), ("max_retry", args.max_retry)) if value is not None})
    if "timezone" in options and "cron" not in options and "every" in options:
        raise UsageError("--timezone is the time zone of --cron; an --every schedule has none")
    return options


def cmd_schedule_create(args: argparse.Namespace, client: Client) -> int:
    options = schedule_options(args)
    if "cron" not in options and "every" not in options:
        raise UsageError("schedule create needs --cron EXPRESSION or --every DURATION")
    msg = msg_text(args.msg)
    made = client.create_schedule(args.schedule_id, args.topic, msg, paused=True if args.paused else None, **options)
    out(schedule_json(made) if args.json else f"created schedule {schedule_summary(made)}")
    return OK


def cmd_schedule_get(args: argparse.Namespace, client: Client) -> int:
    schedule = client.get_schedule(args.schedule_id)
    if schedule is None:
        raise NotFound(f"no schedule {args.schedule_id!r}")
    out(schedule_json(schedule) if args.json else schedule_lines(schedule))
    return OK


def cmd_schedule_list(args: argparse.Namespace, client: Client) -> int:
    page = client.list_schedules(args.topic, limit=args.limit, cursor=args.cursor)
    if args.json:
        out(json.dumps({"schedules": [asdict(s) for s in page.schedules], "next_cursor": page.next_cursor},
                       ensure_ascii=False))
        return OK
    for s in page.schedules:
        out(f"{s.schedule_id}\t{s.topic}\t{schedule_rule(s)}\t{schedule_next(s)}")
    if not page.schedules:
        out("no schedules" if args.topic is None else f"no schedules of topic {args.topic}")
    if page.next_cursor:
        topic = [] if args.topic is None else ["--topic", args.topic]
        out(more_hint(["schedule", "list", *topic], args, page.next_cursor))
    return OK


def cmd_schedule_update(args: argparse.Namespace, client: Client) -> int:
    options = schedule_options(args)
    if args.topic is not None:
        options["topic"] = args.topic
    if args.msg is not None:
        options["msg"] = msg_text(args.msg)
    if not options:
        raise UsageError("schedule update changes what it is given: --cron, --every, --timezone, --topic, --msg, "
                         "--start, --end, --catch-up, --priority, --ttl or --max-retry (pause and resume are "
                         "commands of their own)")
    changed = client.update_schedule(args.schedule_id, **options)
    out(schedule_json(changed) if args.json else f"updated schedule {schedule_summary(changed)}")
    return OK


def cmd_schedule_pause(args: argparse.Namespace, client: Client) -> int:
    paused = client.pause_schedule(args.schedule_id)
    out(schedule_json(paused) if args.json else f"paused schedule {schedule_summary(paused)}")
    return OK


def cmd_schedule_resume(args: argparse.Namespace, client: Client) -> int:
    resumed = client.resume_schedule(args.schedule_id)
    out(schedule_json(resumed) if args.json else f"resumed schedule {schedule_summary(resumed)}")
    return OK


def cmd_schedule_delete(args: argparse.Namespace, client: Client) -> int:
    if not client.delete_schedule(args.schedule_id):
        raise NotFound(f"no schedule {args.schedule_id!r}")
    out(json.dumps({"deleted": True, "schedule_id": args.schedule_id}) if args.json else
        f"deleted schedule {args.schedule_id}")
    return OK


def cmd_schedule_sync(args: argparse.Namespace, client: Client) -> int:
    """app.sync_schedules() of an App (MODULE[:attr], as `worker` finds it); the App brings its own client."""
    for name, option in (("DELAYQUEUE_URL", "url"), ("DELAYQUEUE_TOKEN", "token")):
        if value := getattr(args, option, None):
            os.environ[name] = value
    try:
        app = supervisor.load_app(args.app)
    except supervisor.UnusableApp as exc:
        raise UsageError(str(exc)) from None
    if not callable(getattr(app, "sync_schedules", None)):
        raise UsageError(f"{args.app} is not an App: it has no sync_schedules() method")
    done: dict[str, str] = app.sync_schedules(prune=args.prune)
    if args.json:
        out(json.dumps(done, ensure_ascii=False))
    else:
        for schedule_id, action in done.items():
            out(f"{action} {schedule_id}")
        if not done:
            out(f"no scheduled tasks in {args.app}")
    return OK


def cmd_worker(args: argparse.Namespace, client: Client) -> int:
    """Supervises worker processes of an App (supervisor.py); the App brings its own client."""
    if args.tasks is not None and not args.use_async:
        raise UsageError("--tasks is the number of asyncio tasks of --async; handler threads are --threads")
    try:
        return supervisor.supervise(args)
    except supervisor.UnusableApp as exc:
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
    consume.add_argument("--batch", type=supervisor.positive_int, default=10, help="messages per pull (default 10)")
    consume.add_argument("--count", type=supervisor.positive_int, help="stop after this many messages")
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
    listing.add_argument("--limit", type=supervisor.positive_int, default=DEFAULT_PAGE,
                         help=f"at most this many (default {DEFAULT_PAGE})")
    listing.add_argument("--cursor", type=given_text("the cursor the previous listing printed"),
                         help="the next page, as the previous listing said")
    redrive = command("redrive", cmd_dead_redrive, "send dead letters back to be delivered again", dead_commands)
    redrive.add_argument("topic")
    redrive.add_argument("--msg-id", action="extend", nargs="+", help="only these (default: all of the topic's)")
    redrive.add_argument("--rate", type=supervisor.positive_int,
                         help="messages per second (server default 500, or its DELAYQUEUE_MAX_REDRIVE_RATE when lower)")
    redrive.add_argument("--wait", action="store_true", help="wait until the redrive is done")
    purge = command("purge", cmd_dead_purge, "remove dead letters for good", dead_commands)
    purge.add_argument("topic")
    purge.add_argument("--msg-id", action="extend", nargs="+", help="only these")
    purge.add_argument("--all", action="store_true", help="all of the topic's dead letters")

    schedule = commands.add_parser("schedule", parents=[common], help="schedules (recurring messages): create, get, "
                                   "list, update, pause, resume, delete, sync", description="Schedules: each tick of "
                                   "a cron rule or an interval sends one message.")
    schedule_commands = schedule.add_subparsers(dest="schedule_command", required=True, metavar="COMMAND")

    def schedule_rule_options(sub: argparse.ArgumentParser, updating: bool) -> None:
        rule = sub.add_mutually_exclusive_group()
        rule.add_argument("--cron", type=given_text("5 fields, e.g. '*/5 * * * *'"),
                          help="5 fields: minute hour day-of-month month day-of-week, e.g. '*/5 * * * *'")
        rule.add_argument("--every", type=duration_ms, help="an interval: 1s, 5m, 2h, 1d (at least the server's "
                                                            "minimum, 1s by default)")
        sub.add_argument("--timezone", type=given_text("an IANA time zone, e.g. Europe/Berlin"),
                         help="the cron's IANA time zone, e.g. Europe/Berlin (default UTC)")
        when = instant_or_none if updating else instant_ms
        none = "; none removes it" if updating else ""
        sub.add_argument("--start", type=when, help="an interval's first tick, a cron's earliest: epoch ms or "
                         f"ISO 8601 (no zone: local time){none} (an interval's default: one interval from now)")
        sub.add_argument("--end", type=when, help=f"no tick after this: epoch ms or ISO 8601{none}")
        sub.add_argument("--catch-up", choices=CATCH_UP, help="ticks missed while no scanner ran: latest "
                         "(default) fires the latest once, all each once, skip none")
        sub.add_argument("--priority", type=int, help="each tick's priority, 0 (default) to 9")
        sub.add_argument("--ttl", type=duration_ms, help="each tick's TTL (default: the topic's)")
        sub.add_argument("--max-retry", type=int, help="each tick's maxRetry (default: the topic's)")

    create = command("create", cmd_schedule_create, "create a schedule (--cron or --every)", schedule_commands)
    create.add_argument("schedule_id", metavar="SCHEDULE_ID", help="1-128 letters, digits, '.', '_', ':', '-'")
    create.add_argument("topic")
    create.add_argument("msg", help="each tick's message text; - reads it from standard input")
    schedule_rule_options(create, updating=False)
    create.add_argument("--paused", action="store_true", help="created paused: no tick until resumed")
    show = command("get", cmd_schedule_get, "show a schedule and its next fire times", schedule_commands)
    show.add_argument("schedule_id", metavar="SCHEDULE_ID")
    listing = command("list", cmd_schedule_list, "list schedules in scheduleId order", schedule_commands)
    listing.add_argument("--topic", help="only this topic's")
    listing.add_argument("--limit", type=supervisor.positive_int, default=DEFAULT_PAGE,
                         help=f"at most this many (default {DEFAULT_PAGE})")
    listing.add_argument("--cursor", type=given_text("the cursor the previous listing printed"),
                         help="the next page, as the previous listing said")
    update = command("update", cmd_schedule_update, "change a schedule: what is given", schedule_commands)
    update.add_argument("schedule_id", metavar="SCHEDULE_ID")
    update.add_argument("--topic", help="send its ticks to this topic")
    update.add_argument("--msg", help="each tick's message text; - reads it from standard input")
    schedule_rule_options(update, updating=True)
    for name, handler, help_text in (
            ("pause", cmd_schedule_pause, "pause a schedule: no tick until resumed"),
            ("resume", cmd_schedule_resume, "resume a schedule: ticks from now on"),
            ("delete", cmd_schedule_delete, "delete a schedule and its ticks not yet due")):
        sub = command(name, handler, help_text, schedule_commands)
        sub.add_argument("schedule_id", metavar="SCHEDULE_ID")
    sync = command("sync", cmd_schedule_sync, "create or update the schedules of an App's scheduled tasks",
                   schedule_commands)
    sync.add_argument("app", metavar="MODULE[:attr]", help="the module holding the App (MODULE:attr names it)")
    sync.add_argument("--prune", action="store_true", help="also delete the app's topics' task: schedules that no "
                                                           "task claims")
    return parser


def error_line(error: DelayQueueError) -> str:
    return error.msg if error.code is None else f"{error.code} {error.msg}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, value in vars(args).items():
        if not_utf8(value):
            parser.error(f"argument {name}: not UTF-8 text")
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
    except NotTheAPI as exc:  # a --url (or DELAYQUEUE_URL) leading elsewhere, a proxy's refusal: the caller's to fix
        parser.error(f"{exc.msg} ({shown_url(client.base_url)})")
    except ServerError as exc:  # no answer, or a code 500 the retries did not get past: the server's trouble
        print(f"delayqueue: error: {error_line(exc)} ({shown_url(client.base_url)})", file=sys.stderr)
        return MAYBE_APPLIED if isinstance(exc, MaybeApplied) else UNREACHABLE
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
