"""What the numbers were measured on: cores, memory, server versions."""

from __future__ import annotations

import os
import platform
from typing import Any

import psycopg
import redis


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def describe(database_url: str, redis_url: str) -> dict[str, Any]:
    """Machine facts plus the PostgreSQL and Redis server versions (one query each)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        pg_row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit')"
        ).fetchone()
    client = redis.Redis.from_url(redis_url)
    try:
        info: Any = client.info("server")
    finally:
        client.close()
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "memory_gib": memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "postgresql": pg_row[0] if pg_row else "?",
        "synchronous_commit": pg_row[1] if pg_row else "?",
        "redis": info.get("redis_version", "?"),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        "psycopg": psycopg.__version__,
        "redis_py": redis.__version__,
    }


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set size) of a live process, in MB; None if unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
