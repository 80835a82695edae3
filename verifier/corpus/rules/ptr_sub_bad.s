# a scalar minus a pointer
#@ type kprobe
#@ intent reject
mov %r2, 100
sub %r2, %r10
mov %r0, %r2
exit
