"""The admin's schedule pages (ops/admin/schedules.py): the list, add and change through the
services (their errors on the form), the preview of the next five fire times that saves nothing,
pause / resume / run now / delete on a schedule's page and for the selected ones, the change
permission they need, and a schedule's recent ticks with their outcome and lateness and the
ticks it missed."""
import datetime as dt
import re
import zoneinfo

import pytest
from django.contrib.auth.models import Permission, User

from delayqueue.core.clock import from_millis, now_millis
from delayqueue.core.constants import SCHEDULE_LEAD_MILLIS, Status
from delayqueue.core.exceptions import NotFound
from delayqueue.core.schedules import tick_msg_id
from delayqueue.models import Message, Schedule, ScheduleGap
from delayqueue.runtime import run_with_runtime
from delayqueue.services.consume import ack_message, pull_messages
from delayqueue.services.messages import get_message
from delayqueue.services.schedules import ScheduleSpec, create_schedule, get_schedule, pause_schedule
from delayqueue.stores import rows
from delayqueue.workers.scheduler import Scheduler
from tests.helpers import drain_log

pytestmark = pytest.mark.usefixtures("clean_state")

SCHEDULES = "/admin/delayqueue/schedule/"
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def page_of(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def create(schedule_id="nightly", namespace=None, **fields):
    """A schedule made through the service, as the API makes one."""
    fields = {"topic": "reports", "payload": "{}", **fields}
    if "every_millis" not in fields:
        fields.setdefault("cron", "30 2 * * *")
        fields.setdefault("timezone", "Europe/Berlin")

    async def made(rt):
        return await create_schedule(rt.for_namespace(namespace or rt.ns.namespace),
                                     spec=ScheduleSpec(schedule_id=schedule_id, **fields))

    return run_with_runtime(made)


def stored(schedule_id="nightly", namespace=None):
    async def read(rt):
        return await get_schedule(rt.for_namespace(namespace or rt.ns.namespace), schedule_id=schedule_id)

    return run_with_runtime(read)


def add_form(**changes) -> dict:
    """The add form as a browser posts it (an unchecked "paused" is not sent)."""
    values = {"namespace": "default", "schedule_id": "nightly", "topic": "reports", "payload": "{}",
              "cron": "30 2 * * *", "timezone": "Europe/Berlin", "every_millis": "", "start_time": "", "end_time": "",
              "catch_up": "latest", "priority": "0", "ttl_millis": "0", "max_retry": "-1"}
    return {name: value for name, value in {**values, **changes}.items() if value is not None}


def change_form(page: str, **changes) -> dict:
    """The change form of a schedule's page as a browser posts it, with `changes`."""
    values = dict(re.findall(r'<input type="(?:text|number)" name="(\w+)" value="([^"]*)"', page))
    values["payload"] = re.search(r'<textarea name="payload"[^>]*>\n?([^<]*)</textarea>', page).group(1)
    values["catch_up"] = re.search(r'<select name="catch_up"[^>]*>.*?<option value="(\w+)" selected',
                                   page, re.S).group(1)
    for name in ("every_millis", "start_time", "end_time", "cron"):
        values.setdefault(name, "")
    if re.search(r'<input type="checkbox" name="paused"[^>]*checked', page):
        values["paused"] = "on"
    values.update(changes)
    return {name: value for name, value in values.items() if value is not None}


def section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return page[start:page.index("</table>", start)]


def listed_times(page: str, element_id: str) -> list[int]:
    return [int(t) for t in re.findall(r'<tr class="fire-time" data-millis="(\d+)">', section(page, element_id))]


def change_page(schedule_id="nightly") -> str:
    return f"{SCHEDULES}{Schedule.objects.get(schedule_id=schedule_id).pk}/change/"


def act_url(schedule_id="nightly") -> str:
    return f"{SCHEDULES}{Schedule.objects.get(schedule_id=schedule_id).pk}/act/"


@pytest.fixture
def clerk_client(client):
    """A staff user who may look at schedules but change nothing."""
    user = User.objects.create_user("clerk", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_schedule", "view_message"]))
    client.login(username="clerk", password="pw")
    return client


# --- the list

def test_the_list_shows_each_schedule_with_its_rule_and_next_fire_time_with_filters_and_search(admin_client):
    rows.create_token(namespace="other", scopes=["manage"])  # "other" is now served
    create("nightly")
    create("pulse", topic="beats", every_millis=90_000, catch_up="skip")
    create("elsewhere", namespace="other", topic="reports", cron="0 * * * *", timezone="UTC", paused=True)
    page = page_of(admin_client.get(SCHEDULES))
    assert all(f">{sid}</a>" in page for sid in ("nightly", "pulse", "elsewhere"))
    nightly = page[page.index(">nightly</a>"):]
    nightly = nightly[:nightly.index("</tr>")]
    assert "30 2 * * * (Europe/Berlin)" in nightly and "latest" in nightly.lower()
    assert re.search(r"\d{4}-\d\d-\d\d 02:30:00 CES?T", nightly)  # its next fire time, in its zone
    pulse = page[page.index(">pulse</a>"):]
    assert "every 90 s" in pulse[:pulse.index("</tr>")]
    elsewhere = page[page.index(">elsewhere</a>"):]
    assert "(paused)" in elsewhere[:elsewhere.index("</tr>")]

    def listed(params) -> set[str]:
        return set(re.findall(r'<th class="field-schedule_id"><a href="[^"]+">([^<]+)</a>',
                              page_of(admin_client.get(SCHEDULES, params))))

    assert listed({"kind": "interval"}) == {"pulse"}
    assert listed({"kind": "cron"}) == {"nightly", "elsewhere"}
    assert listed({"paused__exact": "1"}) == {"elsewhere"}
    assert listed({"namespace": "other"}) == {"elsewhere"}
    assert listed({"q": "puls"}) == {"pulse"}
    assert listed({"q": "reports"}) == {"nightly", "elsewhere"}


# --- add and change, through the services

def test_adding_creates_the_schedule_through_the_service_in_the_namespace_chosen(admin_client):
    rows.create_token(namespace="other", scopes=["manage"])
    form = page_of(admin_client.get(SCHEDULES + "add/"))
    assert '<option value="default" selected>' in form and '<option value="other">' in form  # the served namespaces
    saved = admin_client.post(SCHEDULES + "add/", add_form(catch_up="all", priority="3", max_retry="2"))
    assert saved.status_code == 302, saved.content.decode()[:3000]
    row = stored("nightly")
    assert (row.cron, row.timezone, row.every_millis, row.catch_up, row.priority, row.max_retry, row.generation) == (
        "30 2 * * *", "Europe/Berlin", None, "all", 3, 2, 0)
    assert row.plan_at is not None  # planned, as the API's createSchedule plans it

    start = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    again = admin_client.post(SCHEDULES + "add/", add_form(
        namespace="other", schedule_id="pulse", cron="", timezone="", every_millis="60000",
        start_time="2030-01-01 12:00:00.250", end_time=str(int(start.timestamp() * 1000) + 3_600_000), paused="on"))
    assert again.status_code == 302
    pulse = stored("pulse", namespace="other")
    assert (pulse.cron, pulse.timezone, pulse.every_millis, pulse.paused) == ("", "UTC", 60_000, True)
    assert (pulse.start_time, pulse.end_time) == (int(start.timestamp() * 1000) + 250,
                                                  int(start.timestamp() * 1000) + 3_600_000)
    with pytest.raises(NotFound):
        stored("pulse")  # not in the default namespace
    refused = page_of(admin_client.post(SCHEDULES + "add/", add_form(namespace="nowhere", schedule_id="x")))
    assert "Select a valid choice" in refused and not Schedule.objects.filter(schedule_id="x").exists()


@pytest.mark.parametrize("changes, error", [
    ({"cron": "61 * * * *"}, "cron: minute field: 61 is out of range 0-59"),
    ({"cron": "0 0 30 2 *"}, "never fires"),
    ({"timezone": "Mars/Olympus"}, "unknown time zone"),
    ({"every_millis": "60000"}, "give either a cron rule or an interval"),
    ({"cron": "", "every_millis": "500"}, "must be at least 1000"),
    ({"cron": "", "every_millis": "0"}, "must be at least 1000"),  # not "at least 1", which is refused too
    ({"cron": ""}, "give a cron rule or an interval"),
    ({"schedule_id": "has space"}, "letters, digits"),
    ({"topic": "bad\ttopic"}, "without control characters"),
    ({"start_time": "2030-01-02 00:00", "end_time": "2030-01-01 00:00"}, "must not be before the start"),
    ({"start_time": "soon"}, "Enter a valid date/time"),
    ({"start_time": "2020-01-01 00:00", "end_time": "2020-01-02 00:00"}, "endTime must be in the future"),
    ({"cron": "0 0 1 1 *", "start_time": "2030-02-01 00:00", "end_time": "2030-03-01 00:00"},
     "endTime must not be before the first tick after startTime"),
])
def test_a_bad_rule_or_field_is_shown_on_the_form_and_nothing_is_saved(admin_client, changes, error):
    page = page_of(admin_client.post(SCHEDULES + "add/", add_form(**changes)))
    assert error in page.replace("&#x27;", "'") and "errornote" in page
    assert not Schedule.objects.exists()


def test_a_taken_schedule_id_and_the_cap_are_the_services_errors_on_the_form(admin_client, settings):
    create("nightly", topic="elsewhere")
    page = page_of(admin_client.post(SCHEDULES + "add/", add_form()))
    assert "schedule 'nightly' exists: updateSchedule changes it" in page.replace("&#x27;", "'")
    assert Schedule.objects.get().topic == "elsewhere"  # untouched
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_SCHEDULES": 1}
    capped = page_of(admin_client.post(SCHEDULES + "add/", add_form(schedule_id="second")))
    assert "the cap is 1 (DELAYQUEUE_MAX_SCHEDULES)" in capped and Schedule.objects.count() == 1


def test_preview_shows_the_next_five_fire_times_and_saves_nothing(admin_client):
    before = now_millis()
    page = page_of(admin_client.post(SCHEDULES + "add/", add_form(_preview="Preview fire times")))
    assert not Schedule.objects.exists()
    assert "errornote" not in page and 'value="30 2 * * *"' in page  # the form again, as entered
    times = listed_times(page, "preview-list")
    assert len(times) == 5 and before < times[0]
    local = [dt.datetime.fromtimestamp(t / 1000, BERLIN) for t in times]
    assert all((t.hour, t.minute) == (2, 30) for t in local)
    assert [(b.date() - a.date()).days for a, b in zip(local, local[1:])] == [1, 1, 1, 1]
    shown = section(page, "preview-list")
    for t in times[:1]:
        utc = from_millis(t)
        assert f"{utc:%Y-%m-%d %H:%M:%S} UTC" in shown and f"{local[0]:%Y-%m-%d} 02:30:00 CE" in shown

    interval = page_of(admin_client.post(SCHEDULES + "add/", add_form(cron="", every_millis="60000",
                                                                      _preview="Preview fire times")))
    ticks = listed_times(interval, "preview-list")
    assert [b - a for a, b in zip(ticks, ticks[1:])] == [60_000] * 4 and before + 60_000 <= ticks[0]

    bad = page_of(admin_client.post(SCHEDULES + "add/", add_form(cron="* * *", _preview="Preview fire times")))
    assert 'id="preview-error"' in bad and "cron: needs 5 fields" in bad and 'id="preview-list"' not in bad
    assert not Schedule.objects.exists()


def test_the_change_page_shows_the_saved_next_five_and_previews_a_change_without_saving_it(admin_client):
    create("nightly")
    page = page_of(admin_client.get(change_page()))
    saved = listed_times(page, "saved-list")
    assert saved == stored().next_fire_times(now_millis(), 5) and len(saved) == 5
    assert 'name="_preview"' in page and 'name="_save"' in page
    preview = page_of(admin_client.post(change_page(), change_form(page, cron="15 4 * * *",
                                                                   _preview="Preview fire times")))
    previewed = [dt.datetime.fromtimestamp(t / 1000, BERLIN) for t in listed_times(preview, "preview-list")]
    assert len(previewed) == 5 and all((t.hour, t.minute) == (4, 15) for t in previewed)
    assert listed_times(preview, "saved-list") == saved  # the saved schedule, unchanged
    row = stored()
    assert (row.cron, row.generation) == ("30 2 * * *", 0)


def test_changing_goes_through_the_service_and_starts_a_new_generation(admin_client):
    create("nightly")
    page = page_of(admin_client.get(change_page()))
    assert 'name="schedule_id"' not in page and 'name="namespace"' not in page  # add only
    done = admin_client.post(change_page(), change_form(page, cron="0 3 * * 1-5", timezone="UTC", priority="5"))
    assert done.status_code == 302
    row = stored()
    assert (row.cron, row.timezone, row.priority, row.generation) == ("0 3 * * 1-5", "UTC", 5, 1)
    # Saved unchanged: not planned anew.
    page = page_of(admin_client.get(change_page()))
    assert admin_client.post(change_page(), change_form(page)).status_code == 302
    assert stored().generation == 1
    # Made an interval schedule: its start is shown to the ms and saved back as it was.
    admin_client.post(change_page(), change_form(page, cron="", every_millis="30000"))
    row = stored()
    assert (row.cron, row.every_millis, row.generation) == ("", 30_000, 2)
    page = page_of(admin_client.get(change_page()))
    shown = re.search(r'name="start_time" value="([^"]*)"', page).group(1)
    assert from_millis(row.start_time).strftime("%Y-%m-%d %H:%M:%S") in shown
    assert admin_client.post(change_page(), change_form(page)).status_code == 302
    assert stored().generation == 2 and stored().start_time == row.start_time
    # A change the service refuses is shown on the form; nothing changed.
    refused = page_of(admin_client.post(change_page(), change_form(page, every_millis="10")))
    assert "must be at least 1000" in refused and stored().generation == 2
    # One whose endTime has passed since takes a new message, as updateSchedule gives it one; not new times.
    create("ended")
    Schedule.objects.filter(schedule_id="ended").update(end_time=1000)
    page = page_of(admin_client.get(change_page("ended")))
    assert admin_client.post(change_page("ended"), change_form(page, payload="v2")).status_code == 302
    assert stored("ended").payload == "v2"
    refused = page_of(admin_client.post(change_page("ended"), change_form(page, cron="0 4 * * *")))
    assert "endTime must be in the future" in refused and stored("ended").cron == "30 2 * * *"


# --- actions

def plan_once() -> None:
    """One planning round of a scanner's schedule planner."""
    async def plan(rt):
        scheduler = Scheduler(rt, "t")
        try:
            await scheduler.plan_once()
        finally:
            await scheduler.close()

    run_with_runtime(plan)


def tick_of(msg_id: str) -> int:
    """The tick a tick's msgId names (<scheduleId>@<tick>[#<generation>])."""
    return int(msg_id.split("@")[1].split("#")[0])


def test_pause_resume_run_now_and_delete_go_through_the_services(admin_client):
    create("pulse", topic="beats", every_millis=1_000)
    plan_once()  # its ticks sent ahead
    ahead = [m.msg_id for m in Message.objects.filter(topic="beats")]
    assert ahead and all(msg_id.startswith("pulse@") for msg_id in ahead)
    page = page_of(admin_client.get(change_page("pulse")))
    assert 'id="pause"' in page and 'id="run-now"' in page and 'id="delete-schedule"' in page

    paused = page_of(admin_client.post(act_url("pulse"), {"action": "pause"}, follow=True))
    after = now_millis()
    assert "Paused" in paused and 'id="resume"' in paused
    row = stored("pulse")
    assert row.paused and row.generation == 1
    ahead = [msg_id for msg_id in ahead if tick_of(msg_id) > after]  # not yet due when paused: deleted
    assert ahead and {run_with_runtime(get_message, topic="beats", msg_id=m).status for m in ahead} == {
        Status.DELETED}

    resumed = page_of(admin_client.post(act_url("pulse"), {"action": "resume"}, follow=True))
    assert "Resumed" in resumed and not stored("pulse").paused

    sent = page_of(admin_client.post(act_url("pulse"), {"action": "run_now"}, follow=True))
    [run_now] = Message.objects.filter(topic="beats", msg_id__startswith="pulse@run-")
    assert f"message {run_now.msg_id} of topic beats" in sent
    assert run_with_runtime(get_message, topic="beats", msg_id=run_now.msg_id).status == Status.READY

    act = act_url("pulse")
    question = page_of(admin_client.post(act, {"action": "delete"}))
    assert "Delete schedule pulse of namespace default?" in question and 'name="confirmed"' in question
    assert stored("pulse")  # not yet
    plan_once()
    # The ticks sent ahead under its generation now (the log writer, not running here, would mark the older ended).
    ahead = [m.msg_id for m in Message.objects.filter(topic="beats", msg_id__endswith=f"#{stored('pulse').generation}")]
    deleted = admin_client.post(act, {"action": "delete", "confirmed": "on"}, follow=True)
    after = now_millis()
    assert "Deleted schedule pulse" in page_of(deleted) and not Schedule.objects.exists()
    with pytest.raises(NotFound):
        stored("pulse")
    # Those not yet due when it was deleted are deleted with it (one due meanwhile is left to fire).
    ahead = [msg_id for msg_id in ahead if tick_of(msg_id) > after]
    assert ahead and {run_with_runtime(get_message, topic="beats", msg_id=m).status for m in ahead} == {
        Status.DELETED}
    gone = admin_client.post(act, {"action": "pause"}, follow=True)  # deleted meanwhile: a message, no error page
    assert "doesn’t exist" in page_of(gone)


def test_the_selected_schedules_are_paused_resumed_and_deleted_after_a_confirmation(admin_client):
    for sid in ("a", "b", "c"):
        create(sid)
    run_with_runtime(pause_schedule, schedule_id="c")
    selected = list(Schedule.objects.values_list("pk", flat=True))
    paused = page_of(admin_client.post(SCHEDULES, {"action": "pause_selected", "_selected_action": selected},
                                       follow=True))
    assert "Paused 2 schedule(s); 1 were paused already." in paused
    assert all(stored(sid).paused for sid in "abc")
    admin_client.post(SCHEDULES, {"action": "resume_selected", "_selected_action": selected[:2]}, follow=True)
    assert [stored(sid).paused for sid in "abc"] == [False, False, True]
    question = page_of(admin_client.post(SCHEDULES, {"action": "delete_selected_schedules",
                                                     "_selected_action": selected}))
    assert "Delete 3 schedule(s) (a, b, c)?" in question and Schedule.objects.count() == 3
    done = admin_client.post(SCHEDULES, {"action": "delete_selected_schedules", "_selected_action": selected,
                                         "confirmed": "on"}, follow=True)
    assert "Deleted 3 schedule(s)" in page_of(done) and not Schedule.objects.exists()


def test_changes_and_actions_need_the_change_permission(client, clerk_client):
    create("nightly")
    page = page_of(clerk_client.get(change_page()))
    assert "30 2 * * *" in page  # shown, read-only
    for control in ('id="pause"', 'id="run-now"', 'id="delete-schedule"', 'name="_preview"', 'name="_save"'):
        assert control not in page
    assert len(listed_times(page, "saved-list")) == 5 and 'id="tick-list"' in page
    for action in ("pause", "resume", "run_now", "delete"):
        assert clerk_client.post(act_url(), {"action": action, "confirmed": "on"}).status_code == 403
    assert clerk_client.get(act_url()).status_code == 403
    assert clerk_client.post(change_page(), add_form(cron="0 4 * * *")).status_code == 403
    assert clerk_client.get(SCHEDULES + "add/").status_code == 403
    listing = page_of(clerk_client.get(SCHEDULES))
    assert "pause_selected" not in listing and "delete_selected_schedules" not in listing
    clerk_client.post(SCHEDULES, {"action": "delete_selected_schedules", "confirmed": "on",
                                  "_selected_action": list(Schedule.objects.values_list("pk", flat=True))})
    row = stored()
    assert (row.cron, row.paused, row.generation) == ("30 2 * * *", False, 0) and Schedule.objects.count() == 1
    clerk_client.logout()
    anonymous = client.post(act_url(), {"action": "pause"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/")
    assert not stored().paused


# --- history

def test_the_page_shows_a_tick_sent_and_acked_with_its_lateness_and_the_ticks_missed(admin_client):
    create("minutely", topic="beats", cron="* * * * *", timezone="UTC")
    # As if created a few minutes ago and no scanner ran since: the planner finds missed ticks.
    first = (now_millis() // 60_000 - 3) * 60_000
    Schedule.objects.filter(schedule_id="minutely").update(
        planned_until=first - 1, plan_at=first - SCHEDULE_LEAD_MILLIS, created_at=from_millis(first - 60_000))
    plan_once()
    gap = ScheduleGap.objects.get()
    assert (gap.first_tick, gap.fired, gap.policy) == (first, 1, "latest") and gap.missed >= 3
    caught_up = tick_msg_id("minutely", gap.last_tick, 0)

    async def consume(rt):
        pulled, _ = await pull_messages(rt, topic="beats", batch=10)
        assert caught_up in [m.msg_id for m in pulled]  # (with the next tick, had it fallen due meanwhile)
        for message in pulled:
            await ack_message(rt, topic="beats", msg_id=message.msg_id)
        await drain_log(rt, ["beats"])

    run_with_runtime(consume)
    page = page_of(admin_client.get(change_page("minutely")))
    ticks = section(page, "tick-list")
    row = re.search(rf'<tr class="tick (\w+)" data-tick="{gap.last_tick}">(.*?)</tr>', ticks, re.S)
    assert row and row.group(1) == "acked", ticks
    assert caught_up in row.group(2) and re.search(r'class="outcome">acked<', row.group(2))
    # Sent when the planner found it missed (its 'sent' row is its first as ready): that late.
    lateness = re.search(r'class="lateness">([\d.]+) s<', row.group(2)).group(1)
    sent_at = Message.objects.get(msg_id=caught_up).produce_time
    assert float(lateness) == pytest.approx((sent_at - from_millis(gap.last_tick)).total_seconds(), abs=0.001)
    assert float(lateness) > 5  # missed: more than SCHEDULE_MISSED_AFTER_MILLIS late
    # The missed ticks the policy did not send are not in the log.
    assert re.search(rf'data-tick="{first}">.*?class="outcome">not in the log<', ticks, re.S)
    gaps = section(page, "gap-list")
    assert re.search(rf'class="missed">{gap.missed}<.*?class="fired">1<.*?class="policy">latest<', gaps, re.S)
    assert f"{from_millis(first):%Y-%m-%d %H:%M}:00 UTC" in gaps

    # Paused since: a new generation, and the tick of the old one is still found.
    admin_client.post(act_url("minutely"), {"action": "pause"})
    again = section(page_of(admin_client.get(change_page("minutely"))), "tick-list")
    assert re.search(rf'data-tick="{gap.last_tick}">.*?class="outcome">acked<', again, re.S)
