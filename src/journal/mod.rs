//! The write-ahead journal on sled.
