"""The discrete-event simulator: the same Algorithm 1-3 code on a virtual clock."""
