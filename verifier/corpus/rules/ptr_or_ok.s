# or on scalars
#@ type kprobe
#@ intent accept
mov %r2, 1
or %r2, 6
mov %r0, %r2
exit
