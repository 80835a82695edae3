# trace_printk of a 4-byte format
#@ type kprobe
#@ intent accept
stw [%r10-8], 0x000a6968
mov %r1, %r10
add %r1, -8
mov %r2, 4
call 6
mov %r0, 0
exit
