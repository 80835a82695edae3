# reading a register never written
#@ type kprobe
#@ intent reject
mov %r0, %r3
exit
