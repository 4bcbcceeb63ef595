"""Trees and chunk maps (the Merkle structures), the overlay fold, snapshot/rollback/clone."""
