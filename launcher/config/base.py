from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are errors (with a did-you-mean); values are checked on assignment too."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, populate_by_name=True, defer_build=True
    )
