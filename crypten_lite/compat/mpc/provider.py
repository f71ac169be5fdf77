"""CrypTen's provider names. crypten_lite's providers are chosen when a session starts:
TrustedThirdParty maps to crypten_lite's dealer (a separate service that never sees a share
of an input), TrustedFirstParty to its insecure trusted-first-party provider (tests only)."""


class TrustedFirstParty:
    NAME = "TFP"


class TrustedThirdParty:
    NAME = "TTP"
