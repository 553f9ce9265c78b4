"""Background workers run by manage.py run_scanners: scanners, log writers, pushers, redrivers."""
