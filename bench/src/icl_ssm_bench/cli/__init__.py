"""``icl-ssm bench`` and ``icl-ssm synthetic``: flags only, over the harnesses of this package."""
