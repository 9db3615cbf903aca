"""troupe: an LLM inference engine built as a troupe of async actors."""
