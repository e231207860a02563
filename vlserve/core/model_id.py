"""Whether a model option names a Hugging Face Hub model (`org/name`) rather than a local folder.

A local folder always wins: `org/name` is a Hub id only where no such folder exists. The id's shape
is the Hub's own rule (huggingface_hub's validate_repo_id), so a path such as `/models/llava` or
`./llava` is never taken for one.
"""

import os


def hub_model_id(model: str | None) -> str | None:
    """`model` when it is a Hub id and no local folder by that name exists, else None."""
    if not model or os.path.isdir(model):
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        return None
    return model
