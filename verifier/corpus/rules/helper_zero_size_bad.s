# trace_printk with a zero format size
#@ type kprobe
#@ intent reject
stw [%r10-8], 0x000a6968
mov %r1, %r10
add %r1, -8
mov %r2, 0
call 6
mov %r0, 0
exit
