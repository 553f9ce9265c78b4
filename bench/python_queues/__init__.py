"""delayqueue against BullMQ, huey and a hand-written requests loop, all in one run: see __main__."""
