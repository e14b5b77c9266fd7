"""What a long-running process does once its code is loaded."""

import gc


def loaded_objects_freeze() -> None:
    """Keep what the process loaded at start-up (Django, the URLconf, DRF, Celery: a
    few hundred thousand objects that live as long as it does) out of the garbage
    collector's passes. Its full passes otherwise walked them all every few thousand
    requests or tasks: about 0.1 s each, during which none of the process's threads
    ran (``gc.freeze``)."""
    gc.collect()
    gc.freeze()
