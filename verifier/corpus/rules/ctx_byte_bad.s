# a 1-byte read one past the end
#@ type kprobe
#@ intent reject
ldxb %r0, [%r1+168]
exit
