"""CrypTen's safe-class registry for loading modules (crypten_lite never unpickles peer data;
the registry is kept so scripts that call register_safe_class run unchanged)."""

SAFE_CLASSES: set = set()


def register_safe_class(cls) -> None:
    SAFE_CLASSES.add(cls)
