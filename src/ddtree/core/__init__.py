"""Model-free DDTree algorithms: tree build, retrieve encoding, tree attention, verification."""
