"""The one exception constrained decoding raises for bad input."""


class ConstraintError(ValueError):
    """An invalid, unsupported or unsatisfiable regex or JSON schema. The message names the
    problem; the HTTP layer turns it into a 400."""
