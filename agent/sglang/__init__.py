"""SGLang's memory model: version eras, rank attribution, ledgers, the KV budget formula, its rules."""
