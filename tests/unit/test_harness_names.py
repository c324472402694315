from tests.harness import databases


def test_only_this_hosts_databases_of_dead_processes_are_abandoned() -> None:
    host = databases.HOST
    names = [
        f"pbx_t_{host}_100_abc",  # dead process, this host
        f"pbx_tpl_{host}_200_abc",  # live process
        "pbx_t_ffffff_100_abc",  # another host
        "pbx_t_oldstyle",  # not ours to judge
        "postgres",
    ]
    assert databases.abandoned(names, host=host, alive=lambda pid: pid == 200) == [f"pbx_t_{host}_100_abc"]


def test_new_names_carry_host_and_pid() -> None:
    name = databases.new_name("t")
    _, kind, host, pid, _ = name.split("_")
    assert (kind, host, pid.isdigit()) == ("t", databases.HOST, True)
    assert len(name) < 63
