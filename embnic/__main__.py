from embnic.cli.main import main

main()
