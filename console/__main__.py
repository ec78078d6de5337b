"""`python -m console` and the `slo-console` script."""

import gc
import sys


def main() -> int:
    # The imports make ~70k container objects (modules, classes, functions, the profile models' schemas) that
    # live as long as the process. With the collector on, it scanned them in ~100 young and middle-generation
    # collections as they were made, finding ~700 objects of garbage: 2.3% of a one-request batch run's
    # instructions. Off while importing, then frozen: no later collection walks them either (a long run's full
    # collections included); the ~700 objects of import-time garbage are kept.
    gc.disable()
    # The code of the methods `dataclasses` generates, cached across runs like a .pyc (console/code_cache.py):
    # compiling their text was 8% of a one-request batch run.
    from console.code_cache import install

    code_cache = install()
    try:
        from console.cli import main as cli_main
    finally:
        gc.freeze()
        gc.enable()
    if code_cache is not None:
        code_cache.save()
    code = cli_main()
    if code_cache is not None:
        code_cache.save()  # the dataclasses of the modules the command imported as it ran
    # What the command built is garbage now, much of it in reference cycles (the simulator's engine and its
    # clients point at each other, and the engine holds every record), so the interpreter's last collection
    # at exit would walk and free it object by object: 0.18 CPU-s after a 100k-request batch run. Frozen, it
    # is left to the operating system, which takes the memory back at once. Nothing is lost: atexit hooks
    # still run, and every file this program writes is closed explicitly (core/durable_files.py).
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(main())
