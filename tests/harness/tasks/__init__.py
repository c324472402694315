"""Task modules the tests register (importable by worker subprocesses: ``--tasks tests.harness.tasks.worker``)."""
