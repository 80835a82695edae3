# get_stackid into a stack trace map
#@ type kprobe
#@ intent accept
#@ map st stack_trace 4 64 16
ldmap %r2, st
mov %r3, 0
call 27
mov %r0, 0
exit
