# 8 bytes past a 16-byte record
#@ type kprobe
#@ intent reject
#@ map rb ringbuf 0 0 4096
ldmap %r1, rb
mov %r2, 16
mov %r3, 0
call 131
jeq %r0, 0, out
stdw [%r0+16], 1
mov %r1, %r0
mov %r2, 0
call 133
out:
mov %r0, 0
exit
