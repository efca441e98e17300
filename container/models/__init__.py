"""Models the runtime trains. Llama 3 is the one family; specs come from launcher.wire.training.models."""

from container.models.llama import Transformer, TransformerArgs

__all__ = ["Transformer", "TransformerArgs"]
