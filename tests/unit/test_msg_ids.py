"""Generated msgIds: version 7 UUIDs in 32 hex digits, the send's millisecond first, then random
bits from the OS CSPRNG that no other id, thread or forked process gets."""
import os
import random
import threading
import uuid

from delayqueue.core.messages import new_msg_id as _new_msg_id
from delayqueue.core.random_bits import CHUNK_BYTES, SLICE_BYTES


def test_a_generated_id_is_a_uuid7_carrying_the_produce_time():
    produce_time = 1_795_000_000_123
    msg_id = _new_msg_id(produce_time)
    assert len(msg_id) == 32 and msg_id == msg_id.lower() and "-" not in msg_id
    parsed = uuid.UUID(hex=msg_id)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert int(msg_id[:12], 16) == produce_time


def test_ids_sort_by_time_and_do_not_repeat_within_a_millisecond():
    same_ms = {_new_msg_id(1_000) for _ in range(10_000)}
    assert len(same_ms) == 10_000
    assert max(same_ms) < min(_new_msg_id(1_001) for _ in range(100))


def test_the_random_bits_are_the_csprngs_not_the_mersenne_twisters():
    """Seeding `random` the same way must not repeat ids (it did with random.getrandbits)."""
    random.seed(42)
    first = [_new_msg_id(1_000) for _ in range(3)]
    random.seed(42)
    assert not set(first) & {_new_msg_id(1_000) for _ in range(3)}


def test_ids_stay_unique_across_many_chunks_and_threads():
    per_thread, threads = 20 * CHUNK_BYTES // SLICE_BYTES, 4
    made: list[list[str]] = [[] for _ in range(threads)]

    def make(into):
        into.extend(_new_msg_id(7) for _ in range(per_thread))

    workers = [threading.Thread(target=make, args=(into,)) for into in made]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    every = [msg_id for ids in made for msg_id in ids]
    assert len(set(every)) == len(every) == per_thread * threads
    # The random bits spread over their whole range (here the 12 after the version digit).
    randoms = [int(msg_id[13:16], 16) for msg_id in every[:4000]]
    assert min(randoms) < 0x010 and max(randoms) > 0xff0


def test_a_forked_child_does_not_hand_out_its_parents_bits():
    _new_msg_id(1)  # the chunk is in use: a child that kept it would repeat what the parent makes next
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write_end, "".join(_new_msg_id(5) for _ in range(100)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    child_ids = {child[i:i + 32] for i in range(0, len(child), 32)}
    parent_ids = {_new_msg_id(5) for _ in range(100)}
    assert len(child_ids) == 100 and not child_ids & parent_ids
