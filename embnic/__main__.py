from embnic.control.cli import main

main()
