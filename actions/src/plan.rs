//! Pure planning: which slots move where, which replica becomes master. No I/O.
