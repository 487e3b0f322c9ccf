//! The OS as it is: mount table, pod dirs, boot id, the syscall seam.
